"""The dashboard's pages, one module each, with their panels and JSON twins."""
