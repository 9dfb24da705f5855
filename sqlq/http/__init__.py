"""The HTTP front end: the app, its request guard."""
