"""The dashboard: one module per page (each with its Flask Blueprint `bp` and its panels), the panel
registry (panel.py), UI strings (i18n.py), shared page rendering (page.py) and local assets (assets.py).
See docs/dashboard.md."""
