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
#include <openssl/rand.h>

/// OPENSSL_free is a macro.
static inline void relay_openssl_free(void *pointer) { OPENSSL_free(pointer); }

/// An RSA public key from big-endian modulus and exponent. In C because OSSL_PARAM_BLD keeps the
/// parameter-name pointers until it builds, which must be static strings.
static inline EVP_PKEY *relay_rsa_public_key(const unsigned char *modulus, int modulus_length,
                                             const unsigned char *exponent, int exponent_length) {
    EVP_PKEY *key = NULL;
    BIGNUM *n = BN_bin2bn(modulus, modulus_length, NULL);
    BIGNUM *e = BN_bin2bn(exponent, exponent_length, NULL);
    OSSL_PARAM_BLD *builder = OSSL_PARAM_BLD_new();
    OSSL_PARAM *params = NULL;
    EVP_PKEY_CTX *context = NULL;
    if (n == NULL || e == NULL || builder == NULL) goto done;
    if (OSSL_PARAM_BLD_push_BN(builder, OSSL_PKEY_PARAM_RSA_N, n) != 1) goto done;
    if (OSSL_PARAM_BLD_push_BN(builder, OSSL_PKEY_PARAM_RSA_E, e) != 1) goto done;
    params = OSSL_PARAM_BLD_to_param(builder);
    if (params == NULL) goto done;
    context = EVP_PKEY_CTX_new_from_name(NULL, "RSA", NULL);
    if (context == NULL || EVP_PKEY_fromdata_init(context) != 1) goto done;
    if (EVP_PKEY_fromdata(context, &key, EVP_PKEY_PUBLIC_KEY, params) != 1) key = NULL;
done:
    EVP_PKEY_CTX_free(context);
    OSSL_PARAM_free(params);
    OSSL_PARAM_BLD_free(builder);
    BN_free(n);
    BN_free(e);
    return key;
}

/// STACK_OF(X509) accessors are macros in OpenSSL 3.
static inline STACK_OF(X509) *relay_sk_X509_new_null(void) { return sk_X509_new_null(); }
static inline int relay_sk_X509_push(STACK_OF(X509) *stack, X509 *certificate) { return sk_X509_push(stack, certificate); }
static inline int relay_sk_X509_num(const STACK_OF(X509) *stack) { return sk_X509_num(stack); }
static inline X509 *relay_sk_X509_value(const STACK_OF(X509) *stack, int index) { return sk_X509_value(stack, index); }
/// Frees the stack only; the certificates keep their own references.
static inline void relay_sk_X509_free(STACK_OF(X509) *stack) { sk_X509_free(stack); }

/// An HMAC-SHA256 context keyed once. Signing duplicates it, so no message pays for the algorithm
/// fetch and key schedule that the one-shot HMAC() repeats on every call in OpenSSL 3.
static inline EVP_MAC_CTX *relay_hmac_sha256_keyed(const unsigned char *key, size_t length) {
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    if (mac == NULL) return NULL;
    EVP_MAC_CTX *context = EVP_MAC_CTX_new(mac);
    EVP_MAC_free(mac);  // the context keeps its own reference
    if (context == NULL) return NULL;
    OSSL_PARAM params[2];
    params[0] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0);
    params[1] = OSSL_PARAM_construct_end();
    static const unsigned char empty = 0;
    if (EVP_MAC_init(context, length > 0 ? key : &empty, length, params) != 1) {
        EVP_MAC_CTX_free(context);
        return NULL;
    }
    return context;
}
/// HMAC of `first` then `second` into `out` (32 bytes) with a copy of `keyed`; 1 on success. `keyed`
/// is only read, so threads may share it.
static inline int relay_hmac_sha256_sign(const EVP_MAC_CTX *keyed, const unsigned char *first, size_t first_length,
                                         const unsigned char *second, size_t second_length, unsigned char *out) {
    EVP_MAC_CTX *context = EVP_MAC_CTX_dup(keyed);
    if (context == NULL) return 0;
    size_t length = 0;
    int ok = EVP_MAC_update(context, first, first_length) == 1 && EVP_MAC_update(context, second, second_length) == 1
        && EVP_MAC_final(context, out, &length, 32) == 1 && length == 32;
    EVP_MAC_CTX_free(context);
    return ok;
}

#endif
