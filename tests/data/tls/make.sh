#!/bin/sh
# A self-signed certificate for 127.0.0.1 (and localhost) that tests/test_client_http.py
# serves TLS with and trusts through SSL_CERT_FILE, as a user with a private CA would.
# Made once with `sh tests/data/tls/make.sh` (OpenSSL); valid for 100 years.
set -eu
cd "$(dirname "$0")"
openssl req -x509 -newkey rsa:2048 -nodes -days 36500 -subj "/CN=127.0.0.1" \
    -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign" \
    -keyout key.pem -out cert.pem
