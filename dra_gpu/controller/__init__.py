"""The cluster-wide half of the driver: DeviceClasses, admission webhook, leader election.

Layers (core modules never import the kubernetes client; only the I/O modules do):

- pure: :mod:`classes` (desired DeviceClasses and the diff), :mod:`classfile` (administrators'
  classes file), :mod:`selectors` (CEL name checks), :mod:`admission` (AdmissionReview in,
  response out), :mod:`leases` (leader-election decisions), :mod:`registration` (webhook
  configuration objects).
- I/O: :mod:`kube` (JSON over the API client), :mod:`reconciling` (keeps classes applied),
  :mod:`electing` (Lease loop), :mod:`serving` (HTTPS server), :mod:`certs` (certificates),
  :mod:`command` (the ``dra-gpu controller`` subcommand and its lifecycle).
"""
