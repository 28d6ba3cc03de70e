"""Systems realism: a virtual clock of heterogeneous devices (speeds, bandwidth, availability, deadlines)."""
