#!/usr/bin/env bash
# Generates the test PKI and keys under Tests/Fixtures (committed; run again only to replace them):
#
#   apple/   an Apple-shaped PKI: P-384 root and intermediate (intermediate with Apple's OID
#            1.2.840.113635.100.6.2.1), P-256 leaf with OID 1.2.840.113635.100.6.11.1, plus the
#            broken variants the tests reject (no OIDs, a leaf signed by the root, an expired leaf,
#            an untrusted "rogue" PKI of the same shape).
#   google/  RSA keys for Pub/Sub push tokens, their JWKS, and the PEM-map format for the second key;
#            a Play Developer API service account (its RSA key and Google's JSON key-file shape).
#
# Needs only the openssl CLI and perl (both in every Debian base image). Dates are fixed, so
# verification tests pass a signedDate inside them (2030) and outside them.
set -euo pipefail
cd "$(dirname "$0")"
umask 022

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mkdir -p apple google

cat >"$work/ca.cnf" <<'CNF'
[ ca ]
default_ca = relay
[ relay ]
database = $ENV::WORK/index.txt
new_certs_dir = $ENV::WORK
serial = $ENV::WORK/serial
default_md = sha384
policy = anything
unique_subject = no
copy_extensions = none
[ anything ]
commonName = supplied
organizationName = optional
organizationalUnitName = optional
countryName = optional
[ root ]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[ intermediate ]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
1.2.840.113635.100.6.2.1 = ASN1:NULL
[ intermediate_no_oid ]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[ leaf ]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
1.2.840.113635.100.6.11.1 = ASN1:NULL
[ leaf_no_oid ]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
CNF
export WORK="$work"
: >"$work/index.txt"
echo 1000 >"$work/serial"

key() { # curve file
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:"$1" -pkeyopt ec_param_enc:named_curve -out "$2" 2>/dev/null
}

# issue NAME SUBJECT KEY EXTENSIONS ISSUER_CERT ISSUER_KEY START END ; ISSUER_CERT "self" makes it self-signed.
issue() {
    local name=$1 subject=$2 keyfile=$3 extensions=$4 issuer=$5 issuerKey=$6 start=$7 end=$8
    openssl req -new -key "$keyfile" -subj "$subject" -out "$work/${name////_}.csr" 2>/dev/null
    if [ "$issuer" = self ]; then
        openssl ca -batch -config "$work/ca.cnf" -selfsign -keyfile "$keyfile" -in "$work/${name////_}.csr" \
            -extensions "$extensions" -startdate "$start" -enddate "$end" -notext -out "$name" 2>/dev/null
    else
        openssl ca -batch -config "$work/ca.cnf" -cert "$issuer" -keyfile "$issuerKey" -in "$work/${name////_}.csr" \
            -extensions "$extensions" -startdate "$start" -enddate "$end" -notext -out "$name" 2>/dev/null
    fi
}

start=20240101000000Z
for pki in trusted rogue; do
    prefix=apple/
    [ "$pki" = rogue ] && prefix=apple/rogue-
    key secp384r1 "$work/$pki-root.key"
    key secp384r1 "$work/$pki-intermediate.key"
    key prime256v1 "${prefix}leaf.key"
    issue "${prefix}root.pem" "/CN=Relay Test Root CA ($pki)/O=revenue-relay tests" "$work/$pki-root.key" root self "" $start 20491231235959Z
    issue "${prefix}intermediate.pem" "/CN=Relay Test Intermediate ($pki)/O=revenue-relay tests" "$work/$pki-intermediate.key" \
        intermediate "${prefix}root.pem" "$work/$pki-root.key" $start 20461231235959Z
    issue "${prefix}leaf.pem" "/CN=Relay Test Signing ($pki)/O=revenue-relay tests" "${prefix}leaf.key" \
        leaf "${prefix}intermediate.pem" "$work/$pki-intermediate.key" $start 20441231235959Z
done
cp "$work/trusted-root.key" "$work/root.key"

# Variants under the trusted root.
issue apple/leaf-no-oid.pem "/CN=Relay Test Leaf Without OID" apple/leaf.key leaf_no_oid apple/intermediate.pem "$work/trusted-intermediate.key" $start 20441231235959Z
issue apple/leaf-expired.pem "/CN=Relay Test Leaf Expired 2024" apple/leaf.key leaf apple/intermediate.pem "$work/trusted-intermediate.key" $start 20241231235959Z
issue apple/leaf-from-root.pem "/CN=Relay Test Leaf Signed By Root" apple/leaf.key leaf apple/root.pem "$work/root.key" $start 20441231235959Z
key secp384r1 "$work/no-oid-intermediate.key"
issue apple/intermediate-no-oid.pem "/CN=Relay Test Intermediate Without OID" "$work/no-oid-intermediate.key" intermediate_no_oid apple/root.pem "$work/root.key" $start 20461231235959Z
issue apple/leaf-under-intermediate-no-oid.pem "/CN=Relay Test Leaf Under Intermediate Without OID" apple/leaf.key leaf apple/intermediate-no-oid.pem "$work/no-oid-intermediate.key" $start 20441231235959Z
openssl x509 -in apple/root.pem -outform DER -out apple/root.der

# Google push-token keys: JWKS for both, PEM map (v1 certs format) for the second.
b64url() { openssl base64 -A | tr '+/' '-_' | tr -d '='; }
jwk() { # kid keyfile
    local modulus
    modulus=$(openssl rsa -in "$2" -noout -modulus 2>/dev/null | cut -d= -f2 | perl -ne 'chomp; print pack("H*", $_)' | b64url)
    printf '{"kty": "RSA", "alg": "RS256", "use": "sig", "kid": "%s", "n": "%s", "e": "AQAB"}' "$1" "$modulus"
}
for number in 1 2; do
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "google/push-signing-$number.key" 2>/dev/null
done
printf '{"keys": [\n  %s,\n  %s\n]}\n' "$(jwk relay-test-1 google/push-signing-1.key)" "$(jwk relay-test-2 google/push-signing-2.key)" >google/jwks.json
openssl req -new -x509 -key google/push-signing-2.key -subj "/CN=relay-test-2" -days 36500 -out "$work/google-2.pem" 2>/dev/null
printf '{"relay-test-2": "%s"}\n' "$(awk '{printf "%s\\n", $0}' "$work/google-2.pem")" >google/certs-v1.json

# The dev configuration trusts the test root and the test JWKS, so `dev` can be tried with fixtures.
cp apple/root.pem ../../config/dev/apple-test-root.pem
cp google/jwks.json ../../config/dev/google-jwks.json

# Play Developer API service account: an RSA key in PKCS#8 PEM and the JSON key file Google's console
# downloads, with the PEM in "private_key" (newlines as \n). The tests sign the OAuth assertion with it
# and verify it with the key's public half.
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out google/service-account.key 2>/dev/null
pem=$(awk '{printf "%s\\n", $0}' google/service-account.key)
cat >google/service-account.json <<JSON
{
  "type": "service_account",
  "project_id": "relay-test",
  "private_key_id": "test-key-1",
  "private_key": "$pem",
  "client_email": "relay-play@relay-test.iam.gserviceaccount.com",
  "client_id": "100000000000000000001",
  "auth_uri": "https://accounts.google.com/o/oauth2/auth",
  "token_uri": "https://oauth2.googleapis.com/token",
  "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
  "client_x509_cert_url": "https://www.googleapis.com/robot/v1/metadata/x509/relay-play%40relay-test.iam.gserviceaccount.com",
  "universe_domain": "googleapis.com"
}
JSON

echo "fixtures written to $(pwd)"
