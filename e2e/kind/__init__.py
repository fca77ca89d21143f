"""The kind kit: kind, a kind node image built locally, and the driver that runs ``run.sh``."""
