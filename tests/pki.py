"""A test CA with a server certificate for 127.0.0.1/localhost and a client certificate."""

from __future__ import annotations

from pathlib import Path

import trustme


class Pki:
    def __init__(self, root: Path) -> None:
        self.ca = trustme.CA()
        self.ca_pem = root / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_pem))
        server = self.ca.issue_cert("127.0.0.1", "localhost")
        self.cert, self.key = root / "server.pem", root / "server.key"
        for i, pem in enumerate(server.cert_chain_pems):
            pem.write_to_path(str(self.cert), append=i > 0)
        server.private_key_pem.write_to_path(str(self.key))
        client = self.ca.issue_cert("trainer.example")
        self.client_cert, self.client_key = root / "client.pem", root / "client.key"
        client.cert_chain_pems[0].write_to_path(str(self.client_cert))
        client.private_key_pem.write_to_path(str(self.client_key))
