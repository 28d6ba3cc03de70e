"""Server-side wrappers of any algorithm: SWA's and WiMA's averaged models next to the global one, and
local normalization layers kept on the clients.
"""
