#ifndef REVENUE_RELAY_COPENSSL_SHIM_H
#define REVENUE_RELAY_COPENSSL_SHIM_H

/* SwiftPM does not rebuild the modules that import this header when only the header changed: after
   editing it, touch a Swift file of each module that calls what changed (RelayCrypto), or build clean. */

#include <string.h>
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

/// A public key of `type` ("RSA", "EC") from the parameters in `builder`, which it frees; NULL when they
/// do not make one. OSSL_PARAM_BLD keeps the parameter-name pointers until it builds, which must be
/// static strings, so keys are built in C.
static inline EVP_PKEY *relay_public_key_from_parameters(const char *type, OSSL_PARAM_BLD *builder) {
    EVP_PKEY *key = NULL;
    OSSL_PARAM *params = OSSL_PARAM_BLD_to_param(builder);
    EVP_PKEY_CTX *context = params == NULL ? NULL : EVP_PKEY_CTX_new_from_name(NULL, type, NULL);
    if (context != NULL && EVP_PKEY_fromdata_init(context) == 1
        && EVP_PKEY_fromdata(context, &key, EVP_PKEY_PUBLIC_KEY, params) != 1)
        key = NULL;
    EVP_PKEY_CTX_free(context);
    OSSL_PARAM_free(params);
    OSSL_PARAM_BLD_free(builder);
    return key;
}

/// An RSA public key from big-endian modulus and exponent.
static inline EVP_PKEY *relay_rsa_public_key(const unsigned char *modulus, int modulus_length,
                                             const unsigned char *exponent, int exponent_length) {
    EVP_PKEY *key = NULL;
    BIGNUM *n = BN_bin2bn(modulus, modulus_length, NULL);
    BIGNUM *e = BN_bin2bn(exponent, exponent_length, NULL);
    OSSL_PARAM_BLD *builder = OSSL_PARAM_BLD_new();
    if (n != NULL && e != NULL && builder != NULL && OSSL_PARAM_BLD_push_BN(builder, OSSL_PKEY_PARAM_RSA_N, n) == 1
        && OSSL_PARAM_BLD_push_BN(builder, OSSL_PKEY_PARAM_RSA_E, e) == 1) {
        key = relay_public_key_from_parameters("RSA", builder);
    } else {
        OSSL_PARAM_BLD_free(builder);
    }
    BN_free(n);
    BN_free(e);
    return key;
}

/// A P-256 public key from its encoded point (SEC 1, compressed or not).
static inline EVP_PKEY *relay_p256_public_key(const unsigned char *point, size_t length) {
    OSSL_PARAM_BLD *builder = OSSL_PARAM_BLD_new();
    if (builder == NULL || OSSL_PARAM_BLD_push_utf8_string(builder, OSSL_PKEY_PARAM_GROUP_NAME, "prime256v1", 0) != 1
        || OSSL_PARAM_BLD_push_octet_string(builder, OSSL_PKEY_PARAM_PUB_KEY, point, length) != 1) {
        OSSL_PARAM_BLD_free(builder);
        return NULL;
    }
    return relay_public_key_from_parameters("EC", builder);
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

/// ECDSA P-256 verification with a table precomputed for one public key Q (the leaf key of Apple's
/// chain, the same for every notification). A verification is u1·G + u2·Q: OpenSSL multiplies by the
/// standard generator G from its built-in table, and by any other point from scratch, most of the
/// work. Here Q is the generator of a second copy of the curve's group whose multiples OpenSSL
/// precomputes once (`EC_GROUP_precompute_mult`), so both products come from tables. Every step is
/// OpenSSL's arithmetic; these functions only put SEC 1's verification equation together.
///
/// `key`'s public point as the key holds it (SEC 1, compressed or not) in `out` (65 bytes): its length
/// when `key` is a P-256 key, else 0. The one place the curve is checked before a table is found or built.
static inline size_t relay_p256_encoded_point(const EVP_PKEY *key, unsigned char *out) {
    char curve[64];
    size_t curve_length = 0;
    size_t length = 0;
    if (EVP_PKEY_get_group_name(key, curve, sizeof curve, &curve_length) != 1
        || (strcmp(curve, "prime256v1") != 0 && strcmp(curve, "P-256") != 0)
        || EVP_PKEY_get_octet_string_param(key, OSSL_PKEY_PARAM_PUB_KEY, out, 65, &length) != 1)
        return 0;
    return length;
}

/// The group whose generator is the P-256 point `encoded` (`relay_p256_encoded_point`), with its table;
/// NULL when the point is not on P-256, this OpenSSL was built without its deprecated 3.0 calls, or
/// OpenSSL fails. About 21 ms and 150 KB (with the x86_64 and aarch64 assembly's table layout, the only
/// builds the relay uses it on).
///
/// The group keeps P-256's name with another generator, which is what lets a point of the standard group
/// take its products; it never leaves the relay's verification (no key, encoding or TLS ever sees it).
static inline EC_GROUP *relay_p256_fixed_base_group(const unsigned char *encoded, size_t length) {
#ifdef OPENSSL_NO_DEPRECATED_3_0
    (void)encoded, (void)length;
    return NULL;
#else
    EC_GROUP *group = EC_GROUP_new_by_curve_name(NID_X9_62_prime256v1);
    EC_POINT *point = group == NULL ? NULL : EC_POINT_new(group);
    int ok = point != NULL && EC_POINT_oct2point(group, point, encoded, length, NULL) == 1
        && EC_POINT_is_on_curve(group, point, NULL) == 1 && EC_POINT_is_at_infinity(group, point) == 0
        && EC_GROUP_set_generator(group, point, EC_GROUP_get0_order(group), EC_GROUP_get0_cofactor(group)) == 1;
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
    ok = ok && EC_GROUP_precompute_mult(group, NULL) == 1 && EC_GROUP_have_precompute_mult(group) == 1;
#pragma clang diagnostic pop
    EC_POINT_free(point);
    if (!ok) {
        EC_GROUP_free(group);
        return NULL;
    }
    return group;
#endif
}

/// Whether the x coordinate of `point`, reduced mod n, is `r` (in [1, n − 1]), read from its Jacobian
/// coordinates: x = X/Z², so x = r or x = r + n (possible only when r + n < p) is X = r·Z² or X = (r + n)·Z²
/// (mod p), two products instead of the field inversion that affine x costs. The point at infinity (Z = 0)
/// has no x and never matches: OpenSSL's own verification fails to take its x, and so rejects it too.
/// 1: matches; 0: not; -1: OpenSSL failed.
static inline int relay_p256_x_is(const EC_GROUP *group, const EC_POINT *point, const BIGNUM *r, BN_CTX *context) {
#ifdef OPENSSL_NO_DEPRECATED_3_0
    // No table is built without the deprecated calls (`relay_p256_fixed_base_group`), so this never runs.
    (void)group, (void)point, (void)r, (void)context;
    return -1;
#else
    const BIGNUM *p = EC_GROUP_get0_field(group);
    int result = -1;
    BN_CTX_start(context);
    BIGNUM *x = BN_CTX_get(context), *z = BN_CTX_get(context), *zz = BN_CTX_get(context), *candidate = BN_CTX_get(context);
    if (p == NULL || candidate == NULL) goto done;
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wdeprecated-declarations"
    int taken = EC_POINT_get_Jprojective_coordinates_GFp(group, point, x, NULL, z, context);
#pragma clang diagnostic pop
    // Reduced, whatever form the group's method keeps them in (P-256's assembly returns them reduced).
    if (taken != 1 || BN_nnmod(x, x, p, context) != 1 || BN_mod_sqr(zz, z, p, context) != 1) goto done;
    if (BN_is_zero(zz)) {
        result = 0;
        goto done;
    }
    if (BN_mod_mul(candidate, r, zz, p, context) != 1) goto done;
    if (BN_cmp(candidate, x) == 0) {
        result = 1;
        goto done;
    }
    if (BN_add(candidate, r, EC_GROUP_get0_order(group)) != 1) goto done;
    if (BN_cmp(candidate, p) >= 0) {
        result = 0;
        goto done;
    }
    if (BN_mod_mul(candidate, candidate, zz, p, context) != 1) goto done;
    result = BN_cmp(candidate, x) == 0 ? 1 : 0;
done:
    BN_CTX_end(context);
    return result;
#endif
}

/// The most signatures `relay_p256_verify_fixed_base` takes at once.
#define RELAY_P256_BATCH_LIMIT 16

/// Verifies `count` (1 to RELAY_P256_BATCH_LIMIT) raw 64-byte `r‖s` signatures (`signatures`, one after
/// another), each over its 32-byte SHA-256 digest (`digests`, likewise) with the key `fixed[i]` was made
/// for (`standard`: the P-256 group as OpenSSL names it). Writes 1 (valid) or 0 (not) to each `results[i]`
/// and returns 1; returns -1 when OpenSSL failed (the results mean nothing then).
///
/// The same checks as OpenSSL's own verification, for each: r and s in [1, n − 1], u1 = e/s and u2 = r/s
/// mod n, R = u1·G + u2·Q not the point at infinity, and R's x mod n equal to r (`relay_p256_x_is`). What
/// differs is how: the signatures' inverses mod n come from one inversion (Montgomery's trick: with the
/// prefix products P_i = s_0⋯s_i of the signatures in range, 1/s_i = P_{i−1} · (1/P_i), and 1/P_{i−1} =
/// s_i · (1/P_i)), about 10 µs saved for each signature after the first; and R's x is compared in
/// Jacobian coordinates, about 3 µs saved for each. A signature out of range is 0 and takes no part in
/// the product, so it cannot change another's result; each result depends only on its own inputs.
static inline int relay_p256_verify_fixed_base(const EC_GROUP *standard, const EC_GROUP *const *fixed, const unsigned char *digests,
                                               const unsigned char *signatures, int count, BN_CTX *context, int *results) {
    if (count < 1 || count > RELAY_P256_BATCH_LIMIT) return -1;
    const BIGNUM *order = EC_GROUP_get0_order(standard);
    EC_POINT *product = EC_POINT_new(standard);
    EC_POINT *keyed = EC_POINT_new(standard);
    int status = -1;
    BN_CTX_start(context);
    BIGNUM *r[RELAY_P256_BATCH_LIMIT], *s[RELAY_P256_BATCH_LIMIT], *prefix[RELAY_P256_BATCH_LIMIT];
    BIGNUM *inverse = BN_CTX_get(context), *w = BN_CTX_get(context), *e = BN_CTX_get(context);
    BIGNUM *u1 = BN_CTX_get(context), *u2 = BN_CTX_get(context);
    for (int i = 0; i < count; i++) {
        r[i] = BN_CTX_get(context);
        s[i] = BN_CTX_get(context);
        prefix[i] = BN_CTX_get(context);
    }
    // Once BN_CTX_get fails every later call does: the last one tells.
    if (product == NULL || keyed == NULL || prefix[count - 1] == NULL) goto done;
    for (int i = 0; i < count; i++)
        if (fixed[i] == NULL) goto done;
    const BIGNUM *running = NULL;
    for (int i = 0; i < count; i++) {
        const unsigned char *signature = signatures + 64 * (size_t)i;
        if (BN_bin2bn(signature, 32, r[i]) == NULL || BN_bin2bn(signature + 32, 32, s[i]) == NULL) goto done;
        results[i] = !(BN_is_zero(r[i]) || BN_is_zero(s[i]) || BN_ucmp(r[i], order) >= 0 || BN_ucmp(s[i], order) >= 0);
        if (!results[i]) continue;
        if (running == NULL ? BN_copy(prefix[i], s[i]) == NULL : BN_mod_mul(prefix[i], running, s[i], order, context) != 1) goto done;
        running = prefix[i];
    }
    if (running == NULL) {
        status = 1;
        goto done;
    }
    if (BN_mod_inverse(inverse, running, order, context) == NULL) goto done;
    // Backwards: `inverse` is 1/P_i, the inverse of the product of the signatures in range up to i. The
    // results below i still say which are in range.
    for (int i = count - 1; i >= 0; i--) {
        if (!results[i]) continue;
        int before = i - 1;
        while (before >= 0 && !results[before]) before--;
        if (before >= 0) {
            if (BN_mod_mul(w, inverse, prefix[before], order, context) != 1 || BN_mod_mul(inverse, inverse, s[i], order, context) != 1)
                goto done;
        } else if (BN_copy(w, inverse) == NULL) {
            goto done;
        }
        // P-256's order has 256 bits, so the digest is used whole (no truncation), reduced by the products.
        if (BN_bin2bn(digests + 32 * (size_t)i, 32, e) == NULL || BN_mod_mul(u1, e, w, order, context) != 1
            || BN_mod_mul(u2, r[i], w, order, context) != 1)
            goto done;
        if (EC_POINT_mul(standard, product, u1, NULL, NULL, context) != 1 || EC_POINT_mul(fixed[i], keyed, u2, NULL, NULL, context) != 1
            || EC_POINT_add(standard, product, product, keyed, context) != 1)
            goto done;
        int matches = relay_p256_x_is(standard, product, r[i], context);
        if (matches < 0) goto done;
        results[i] = matches;
    }
    status = 1;
done:
    BN_CTX_end(context);
    EC_POINT_free(product);
    EC_POINT_free(keyed);
    return status;
}

#endif
