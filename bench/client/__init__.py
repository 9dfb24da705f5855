"""The benchmark's client side: a minimal HTTP client, the load generator, and the
``sqlq serve`` subprocess it drives."""
