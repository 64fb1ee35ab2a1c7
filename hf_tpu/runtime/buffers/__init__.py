"""The placement layer: every device array is made and placed here (chips, mesh, shardings,
host<->device copies, per-chip memory, storages' payloads, donation/update locks, executables' budget)."""
