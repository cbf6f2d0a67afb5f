#ifndef REVENUE_RELAY_CCURL_SHIM_H
#define REVENUE_RELAY_CCURL_SHIM_H

#include <curl/curl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

/// curl_easy_setopt and curl_easy_getinfo are variadic; Swift needs one typed entry point per argument kind.
static inline CURLcode relay_curl_setopt_long(CURL *handle, CURLoption option, long value) {
    return curl_easy_setopt(handle, option, value);
}
static inline CURLcode relay_curl_setopt_string(CURL *handle, CURLoption option, const char *value) {
    return curl_easy_setopt(handle, option, value);
}
static inline CURLcode relay_curl_setopt_pointer(CURL *handle, CURLoption option, void *value) {
    return curl_easy_setopt(handle, option, value);
}
static inline CURLcode relay_curl_setopt_slist(CURL *handle, CURLoption option, struct curl_slist *value) {
    return curl_easy_setopt(handle, option, value);
}
static inline CURLcode relay_curl_setopt_off_t(CURL *handle, CURLoption option, curl_off_t value) {
    return curl_easy_setopt(handle, option, value);
}
typedef size_t (*relay_curl_data_callback)(char *data, size_t size, size_t count, void *context);
static inline CURLcode relay_curl_setopt_write_function(CURL *handle, relay_curl_data_callback callback) {
    return curl_easy_setopt(handle, CURLOPT_WRITEFUNCTION, callback);
}
static inline CURLcode relay_curl_setopt_header_function(CURL *handle, relay_curl_data_callback callback) {
    return curl_easy_setopt(handle, CURLOPT_HEADERFUNCTION, callback);
}
static inline CURLcode relay_curl_getinfo_long(CURL *handle, CURLINFO info, long *value) {
    return curl_easy_getinfo(handle, info, value);
}
static inline CURLcode relay_curl_getinfo_double(CURL *handle, CURLINFO info, double *value) {
    return curl_easy_getinfo(handle, info, value);
}

static inline CURLMcode relay_curl_multi_setopt_long(CURLM *multi, CURLMoption option, long value) {
    return curl_multi_setopt(multi, option, value);
}
typedef curl_socket_t (*relay_curl_opensocket_callback)(void *context, curlsocktype purpose, struct curl_sockaddr *address);
static inline CURLcode relay_curl_setopt_opensocket_function(CURL *handle, relay_curl_opensocket_callback callback) {
    return curl_easy_setopt(handle, CURLOPT_OPENSOCKETFUNCTION, callback);
}
/// The textual IP address curl is about to connect to, into `out`; 0 on success.
static inline int relay_curl_sockaddr_ip(const struct curl_sockaddr *address, char *out, socklen_t length) {
    const void *raw = &address->addr;
    if (address->family == AF_INET) {
        return inet_ntop(AF_INET, &((const struct sockaddr_in *)raw)->sin_addr, out, length) ? 0 : -1;
    }
    if (address->family == AF_INET6) {
        return inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)raw)->sin6_addr, out, length) ? 0 : -1;
    }
    return -1;
}
/// What curl's default open-socket does.
static inline curl_socket_t relay_curl_open_socket(const struct curl_sockaddr *address) {
    return socket(address->family, address->socktype, address->protocol);
}
/// The finished transfer and its result from a CURLMSG_DONE message.
static inline CURL *relay_curl_msg_easy(CURLMsg *message) { return message->easy_handle; }
static inline CURLcode relay_curl_msg_result(CURLMsg *message) { return message->data.result; }
static inline int relay_curl_msg_is_done(CURLMsg *message) { return message->msg == CURLMSG_DONE; }

#endif
