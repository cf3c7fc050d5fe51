"""Read models shared by GraphQL and the dashboard: shipments with their orders, items, observed
LPNs and pallets, listed through one filter."""
