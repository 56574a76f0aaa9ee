"""A minimal paged-KV executor that runs schedules batch by batch and times them (docs/executor.md).

Importing this package does not import torch: `kvbound/cli/executor.py` (profile, calibrate,
replay) imports the executor's modules inside its commands, so kvbound works without the
`executor` extra.
"""
