"""Optimizers as optax transforms: sharpness-aware clients (sam.py, asam.py), the client chain (client.py), the
server optimizers on the pseudo-gradient (server.py), and every schedule (schedules.py). Import the module that
defines a name, e.g. `from fedjax_flat.optimizers.sam import sam`."""
