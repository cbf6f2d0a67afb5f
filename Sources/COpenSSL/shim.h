#ifndef REVENUE_RELAY_COPENSSL_SHIM_H
#define REVENUE_RELAY_COPENSSL_SHIM_H

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <openssl/x509_vfy.h>
#include <openssl/pem.h>
#include <openssl/ec.h>
#include <openssl/ecdsa.h>
#include <openssl/bn.h>
#include <openssl/rsa.h>
#include <openssl/core_names.h>
#include <openssl/param_build.h>
#include <openssl/objects.h>

/// OPENSSL_free is a macro.
static inline void relay_openssl_free(void *pointer) { OPENSSL_free(pointer); }

/// EVP_PKEY_PUBLIC_KEY is a compound macro.
static inline int relay_evp_pkey_public_key_selection(void) { return EVP_PKEY_PUBLIC_KEY; }

/// STACK_OF(X509) accessors are macros in OpenSSL 3.
static inline STACK_OF(X509) *relay_sk_X509_new_null(void) { return sk_X509_new_null(); }
static inline int relay_sk_X509_push(STACK_OF(X509) *stack, X509 *certificate) { return sk_X509_push(stack, certificate); }
static inline int relay_sk_X509_num(const STACK_OF(X509) *stack) { return sk_X509_num(stack); }
static inline X509 *relay_sk_X509_value(const STACK_OF(X509) *stack, int index) { return sk_X509_value(stack, index); }
/// Frees the stack only; the certificates keep their own references.
static inline void relay_sk_X509_free(STACK_OF(X509) *stack) { sk_X509_free(stack); }

#endif
