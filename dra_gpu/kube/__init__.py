"""Kubernetes API I/O shared by the kubelet plugin and the controller.

- :mod:`errors`: one error hierarchy by HTTP status (standard library only, so core logic may
  catch these without loading any client).
- :mod:`credentials`: every credential the driver reads (the service account, a kubeconfig, and
  through the official loader the kubeconfigs it needs); the only module that reads them.
- :mod:`transport`: HTTP over urllib3 (one pool per server, proxies, timeouts, one retry of a
  broken GET); the only module that imports urllib3.
- :mod:`client`: JSON requests, watches and the server's warnings over :mod:`transport`.

The official ``kubernetes`` client is imported only by :mod:`credentials`, for kubeconfigs that
need its loader (exec plugins, auth providers, a proxy-url), so a node plugin's start-up time
and memory stay small.
This package re-exports nothing: importing ``errors`` must not pull in the transport.
"""
