"""Who may call: access tokens and the external issuer, API-client and camera credentials,
failed-login throttling, operator sessions, and the encryption of credentials kept at rest."""
