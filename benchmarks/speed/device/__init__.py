"""The device kit (README.md): one prepared command that measures the accelerator table in a short window."""
