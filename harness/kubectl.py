"""The real kubectl, run against a local cluster: for tests and the real-node harness."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Kubectl:
    """The real kubectl bound to the cluster's kubeconfig (and optionally a namespace)."""

    binary: Path
    kubeconfig: Path
    namespace: str | None = None

    def __call__(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl args...``; raises CalledProcessError on failure when ``check``."""
        argv = [
            str(self.binary),
            *(["--namespace", self.namespace] if self.namespace else []),
            *args,
        ]
        result = subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
            check=False,
        )
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(
                result.returncode, argv, output=result.stdout, stderr=result.stderr
            )
        return result
