"""The shipped rationale libraries (YAML or JSON). Installed as the package ``ssr_server.candidates``
(pyproject maps this folder there), so an installed server finds them with importlib.resources."""
