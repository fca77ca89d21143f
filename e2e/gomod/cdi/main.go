// Validates CDI spec files with the reference library: exit 1 if any is invalid.
package main

import (
	"fmt"
	"os"

	"tags.cncf.io/container-device-interface/pkg/cdi"
)

func main() {
	status := 0
	for _, path := range os.Args[1:] {
		if _, err := cdi.ReadSpec(path, 0); err != nil {
			fmt.Fprintf(os.Stderr, "%s: invalid: %v\n", path, err)
			status = 1
			continue
		}
		fmt.Printf("%s: valid\n", path)
	}
	os.Exit(status)
}
