"""The executor: a minimal paged-KV engine that runs schedules batch by batch and times them
(docs/executor.md). `engine_bridge` is the design card's name for it, kept as the package's name.

Importing this package does not import torch: `kvbound/cli/executor.py` (profile, calibrate,
replay) imports the executor's modules inside its commands, so kvbound works without the
`executor` extra.
"""
