"""The host as a machine's processes meet it: app identities, cgroups, /proc, log files and
files written for a machine. Imports nothing of the worker's, so the drivers and the image code
stand on it."""
