"""Composers: how the deliveries of an endpoint kind that speaks another standard become its
requests, built from stored records (EPCIS documents of pallet readings, the ASN of a shipment).
They read what lies above the outbox (shipments, the ASN, EPCIS events), so they sit above it."""
