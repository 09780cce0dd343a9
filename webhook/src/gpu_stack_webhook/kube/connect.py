"""The `kubernetes` ApiClient both users of the API build: `serve` (in-cluster first) and `inspect` (the user's
kubeconfig first). The `kubernetes` package is imported inside the function, for the reason client.py's
docstring gives (start-up time)."""

from __future__ import annotations

import os
from typing import Any


class ClientConfigError(Exception):
    """No usable cluster access (no kubeconfig, no in-cluster ServiceAccount); the message says what to do."""


def api_client(kubeconfig: str | None = None, context: str | None = None, *, in_cluster_first: bool = False) -> Any:
    """A `kubernetes` ApiClient with one attempt per call (callers decide about retrying).

    in_cluster_first (`serve`, in a pod): the pod's ServiceAccount unless a kubeconfig file is named; the
    client's own exceptions propagate. Otherwise (`inspect`, on a workstation): the user's kubeconfig
    ($KUBECONFIG, ~/.kube/config, `context`), else the in-cluster account; a ClientConfigError when neither
    works."""
    from kubernetes import client, config  # noqa: PLC0415 - start-up time, see the module docstring
    from kubernetes.config.config_exception import ConfigException  # noqa: PLC0415

    configuration = client.Configuration()
    if in_cluster_first:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, context=context,  # type: ignore[no-untyped-call]
                                    client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        try:
            config.load_kube_config(config_file=kubeconfig, context=context,  # type: ignore[no-untyped-call]
                                    client_configuration=configuration)
        except (ConfigException, OSError) as kube_error:
            if kubeconfig or context:
                raise ClientConfigError(f"cannot use kubeconfig: {kube_error}") from None
            try:
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            except ConfigException:
                raise ClientConfigError(f"no cluster access: {kube_error} (set KUBECONFIG or pass --kubeconfig)"
                                        ) from None
    configuration.retries = False
    api = client.ApiClient(configuration)
    # `serve` builds its app in gunicorn's master (preload_app) and forks the workers: a pooled connection the
    # master opened would be shared by every process, each writing requests to and reading answers from the
    # same socket (the master's TLS renewer, the workers' live policy reads and lookups). A child starts with
    # no connection of its own; closing its copy of the socket leaves the master's open.
    os.register_at_fork(after_in_child=api.rest_client.pool_manager.clear)
    return api
