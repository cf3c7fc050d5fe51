"""Shipments at the docks: lifecycle and statuses, eligibility and links, scheduling events,
dock events, completion, and the files attached to a shipment."""
