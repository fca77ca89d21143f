"""``dra-gpu validate``: is a GPU node ready for work? (``steps`` judges, ``command`` runs)."""
