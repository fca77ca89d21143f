// Command celmatch times Kubernetes' own device-selector evaluation (the scheduler's
// DeviceMatches, from k8s.io/dynamic-resource-allocation) on the devices that bench/cel_match.py
// sends it, so that what a slice layout costs the scheduler per device can be read without a
// cluster around it.
//
// Input on stdin: {"blocks": B, "devices_per_block": N, "cases": [{"name", "driver",
// "expressions", "devices"}]}; each device is a resource.k8s.io/v1 Device as published.
// The cases take turns, block by block (a busy machine then slows all of them alike), each
// block evaluating every expression on N devices, cycling through the case's devices, after a
// garbage collection (so one case's garbage is not collected on another's time).
// Output: one JSON object per case on stdout, {"name", "ns_per_device" (the median over the
// blocks), "ns_per_device_min", "matched" (of the case's devices, by all expressions)}.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"sort"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
)

type benchCase struct {
	Name        string               `json:"name"`
	Driver      string               `json:"driver"`
	Expressions []string             `json:"expressions"`
	Devices     []resourceapi.Device `json:"devices"`
}

type input struct {
	Blocks          int         `json:"blocks"`
	DevicesPerBlock int         `json:"devices_per_block"`
	Cases           []benchCase `json:"cases"`
}

type result struct {
	Name           string  `json:"name"`
	NsPerDevice    float64 `json:"ns_per_device"`
	NsPerDeviceMin float64 `json:"ns_per_device_min"`
	Matched        int     `json:"matched"`
}

type compiled struct {
	name     string
	programs []cel.CompilationResult
	devices  []cel.Device
	samples  []float64
}

func compile(c benchCase) (*compiled, error) {
	compiler := cel.GetCompiler(cel.Features{})
	out := &compiled{name: c.Name}
	for _, expression := range c.Expressions {
		r := compiler.CompileCELExpression(expression, cel.Options{})
		if r.Error != nil {
			return nil, fmt.Errorf("%s: %q: %w", c.Name, expression, r.Error)
		}
		out.programs = append(out.programs, r)
	}
	for _, d := range c.Devices {
		out.devices = append(out.devices, cel.Device{
			Driver:                   c.Driver,
			AllowMultipleAllocations: d.AllowMultipleAllocations,
			Attributes:               d.Attributes,
			Capacity:                 d.Capacity,
		})
	}
	if len(out.devices) == 0 {
		return nil, fmt.Errorf("%s: no devices", c.Name)
	}
	return out, nil
}

// matches evaluates as the allocator does: the class's selectors, then the request's; the
// first that does not match ends the device's evaluation.
func (c *compiled) matches(ctx context.Context, device cel.Device) (bool, error) {
	for _, program := range c.programs {
		ok, _, err := program.DeviceMatches(ctx, device)
		if err != nil {
			return false, fmt.Errorf("%s: %w", c.name, err)
		}
		if !ok {
			return false, nil
		}
	}
	return true, nil
}

func (c *compiled) block(ctx context.Context, n int) error {
	runtime.GC()
	start := time.Now()
	for i := 0; i < n; i++ {
		if _, err := c.matches(ctx, c.devices[i%len(c.devices)]); err != nil {
			return err
		}
	}
	c.samples = append(c.samples, float64(time.Since(start).Nanoseconds())/float64(n))
	return nil
}

func (c *compiled) result(ctx context.Context) (result, error) {
	matched := 0
	for _, device := range c.devices {
		ok, err := c.matches(ctx, device)
		if err != nil {
			return result{}, err
		}
		if ok {
			matched++
		}
	}
	sorted := append([]float64(nil), c.samples...)
	sort.Float64s(sorted)
	return result{
		Name:           c.name,
		NsPerDevice:    sorted[len(sorted)/2],
		NsPerDeviceMin: sorted[0],
		Matched:        matched,
	}, nil
}

func run(in input) ([]result, error) {
	if in.Blocks < 1 || in.DevicesPerBlock < 1 {
		return nil, fmt.Errorf("blocks and devices_per_block must be at least 1")
	}
	ctx := context.Background()
	cases := make([]*compiled, 0, len(in.Cases))
	for _, c := range in.Cases {
		compiledCase, err := compile(c)
		if err != nil {
			return nil, err
		}
		cases = append(cases, compiledCase)
	}
	for b := 0; b < in.Blocks; b++ {
		for _, c := range cases {
			if err := c.block(ctx, in.DevicesPerBlock); err != nil {
				return nil, err
			}
		}
	}
	results := make([]result, 0, len(cases))
	for _, c := range cases {
		r, err := c.result(ctx)
		if err != nil {
			return nil, err
		}
		results = append(results, r)
	}
	return results, nil
}

func main() {
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintf(os.Stderr, "celmatch: reading the input: %v\n", err)
		os.Exit(2)
	}
	results, err := run(in)
	if err != nil {
		fmt.Fprintf(os.Stderr, "celmatch: %v\n", err)
		os.Exit(1)
	}
	out := json.NewEncoder(os.Stdout)
	for _, r := range results {
		if err := out.Encode(r); err != nil {
			fmt.Fprintf(os.Stderr, "celmatch: %v\n", err)
			os.Exit(1)
		}
	}
}
