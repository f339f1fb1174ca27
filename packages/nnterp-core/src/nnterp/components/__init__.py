"""The standard envoys: what a family wraps its modules in."""
