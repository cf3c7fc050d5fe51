"""Tenants and identities managed by the operator (`tenants`) and the declarative file that
provisions them (`provisioning`)."""
