"""The engine as a service shell: the runner (start-up and teardown), the HTTP surface (ingest, status,
operator calls), de-duplication of event ids, metrics and the status read model. The action domain lives in
:mod:`watchd.actions`, the state in :mod:`watchd.store`, the integrations in :mod:`watchd.integrations`."""
