"""The cluster-wide half of the driver: DeviceClasses, admission webhook, leader election.

Layers (core modules never import an API client; only the I/O modules do):

- pure: :mod:`classes` (desired DeviceClasses and the diff), :mod:`classfile` (administrators'
  classes file), :mod:`selectors` (CEL name checks), :mod:`admission` (AdmissionReview in,
  response out), :mod:`leases` (leader-election decisions), :mod:`registration` (webhook
  configuration objects).
- I/O: :mod:`reconciling` (keeps classes applied), :mod:`electing` (Lease loop),
  :mod:`serving` (HTTPS server), :mod:`certs` (certificates), :mod:`command` (the
  ``dra-gpu controller`` subcommand and its lifecycle). API requests go through the shared
  :mod:`dra_gpu.kube.client` (JSON over HTTP/1.1), as the kubelet plugin's do.
"""
