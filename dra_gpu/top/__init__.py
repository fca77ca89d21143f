"""``dra-gpu top``: GPU utilization, memory and idle time by node, device, claim and pod."""
