"""Pallet readings from dock cameras: validation, matching to a shipment, and the pallet message."""
