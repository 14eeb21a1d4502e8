"""`octavo-operator selfcheck`: the chart's `helm test` — is the CRD served, is the operator up?"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request

from kubernetes import client

from octavo_operator import constants as c
from octavo_operator.kube import Kube, load_api_client


def crd_served(kubeconfig: str | None) -> bool:
    return Kube(load_api_client(kubeconfig)).served(c.API_VERSION, c.PLURAL)


def operator_healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def selfcheck(operator_url: str, kubeconfig: str | None, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        try:
            served = crd_served(kubeconfig)
        except client.ApiException as error:
            served = False
            print(f"discovery failed: {error.status} {error.reason}", file=sys.stderr)
        healthy = operator_healthy(operator_url)
        if served and healthy:
            print(f"ok: {c.CRD_NAME} is served and {operator_url} answers 200")
            return 0
        if time.monotonic() >= deadline:
            print(
                f"failed: CRD {c.CRD_NAME} served={served}, "
                f"operator {operator_url} healthy={healthy}",
                file=sys.stderr,
            )
            return 1
        time.sleep(2)
