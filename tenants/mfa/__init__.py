"""Two-factor sign-in for password accounts: an authenticator app (TOTP, RFC 6238) with
single-use recovery codes, asked for after the password and before the session is signed in.
Single sign-on users are not asked (their provider does MFA); API tokens are unaffected."""
