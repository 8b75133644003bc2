"""Notification channels, the broadcast and the signed webhook / e-mail delivery."""
