#ifndef REVENUE_RELAY_COPENSSL_SHIM_H
#define REVENUE_RELAY_COPENSSL_SHIM_H

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <openssl/pem.h>
#include <openssl/ec.h>
#include <openssl/ecdsa.h>
#include <openssl/bn.h>
#include <openssl/rsa.h>
#include <openssl/core_names.h>

/// OPENSSL_free is a macro.
static inline void relay_openssl_free(void *pointer) { OPENSSL_free(pointer); }

#endif
