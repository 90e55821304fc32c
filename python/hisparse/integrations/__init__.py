"""Adapters of hisparse to the model code users already run, built only on
hisparse's public API. Each adapter is its own module, imported on demand
(``hisparse.integrations.transformers`` needs transformers >= 5.24)."""
