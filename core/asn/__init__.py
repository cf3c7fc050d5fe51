"""Advance ship notices built from what was loaded (docs/asn.md): the notice from a shipment's
observed pallets (`notice`), the trading-partner profile and control numbers (`partners`), the
X12 856 and EDIFACT DESADV writers (`x12`, `desadv`), and issuing a document (`issue`)."""
