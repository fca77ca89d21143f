"""``make e2e-deployed``: the driver deployed as users deploy it (image, chart, upgrade,
uninstall; ``run``) on the environment ``env`` brings up.
"""
