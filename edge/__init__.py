"""gRPC edge: the PalletIngest servicer for cameras, translating proto <-> core calls."""
