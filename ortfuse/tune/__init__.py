"""``fusion="auto"``: measure each fusion against ORT on this machine and keep the winners."""
