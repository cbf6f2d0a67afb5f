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

#endif
