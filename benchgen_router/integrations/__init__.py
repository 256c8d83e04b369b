"""The router inside gateways users already run (pip install 'benchgen-router[litellm]').

    engine         the router behind a plugin: loaded once per process, scored on a worker thread,
                   concurrent requests merged into shared forward passes
    litellm        LiteLLM's routing plugin and complexity-router classifier plugin
    litellm_proxy  the LiteLLM Proxy's x-benchgen-* response headers (a proxy callback)

docs/integrations/litellm.md has the set-up, the metadata keys and the measurements.
"""
