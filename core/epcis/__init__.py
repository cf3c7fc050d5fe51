"""The supply chain's standards out: GS1 identities of businesses, facilities and docks, and
EPCIS 2.0 events of what the cameras saw (docs/epcis.md)."""
