"""The SGLang engine: ``client`` talks to an SGLang server over HTTP; ``server`` runs inside SGLang's
process and adds the ``/ssr/score`` route (see ``server.py`` for the JSON contract)."""
