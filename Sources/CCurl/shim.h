#ifndef REVENUE_RELAY_CCURL_SHIM_H
#define REVENUE_RELAY_CCURL_SHIM_H

#include <curl/curl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <errno.h>
#include <stdint.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

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
typedef int (*relay_curl_closesocket_callback)(void *context, curl_socket_t socket);
/// Every socket of the connections this handle makes is closed through `callback` (with `context`).
static inline CURLcode relay_curl_setopt_closesocket_function(CURL *handle, relay_curl_closesocket_callback callback, void *context) {
    CURLcode code = curl_easy_setopt(handle, CURLOPT_CLOSESOCKETFUNCTION, callback);
    return code != CURLE_OK ? code : curl_easy_setopt(handle, CURLOPT_CLOSESOCKETDATA, context);
}
static inline int relay_close_socket(curl_socket_t socket) { return close(socket); }
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
/// What curl's default open-socket does, close-on-exec: a child process started meanwhile does not
/// keep the connection open.
static inline curl_socket_t relay_curl_open_socket(const struct curl_sockaddr *address) {
    return socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
}
/// Event-driven multi handle (curl_multi_socket_action): curl says which sockets to watch and when
/// its next timeout is; the caller's epoll loop reports readiness back.
typedef int (*relay_curl_socket_callback)(CURL *easy, curl_socket_t socket, int what, void *context, void *socketContext);
typedef int (*relay_curl_timer_callback)(CURLM *multi, long timeoutMilliseconds, void *context);
static inline CURLMcode relay_curl_multi_set_socket_function(CURLM *multi, relay_curl_socket_callback callback, void *context) {
    CURLMcode code = curl_multi_setopt(multi, CURLMOPT_SOCKETFUNCTION, callback);
    return code != CURLM_OK ? code : curl_multi_setopt(multi, CURLMOPT_SOCKETDATA, context);
}
static inline CURLMcode relay_curl_multi_set_timer_function(CURLM *multi, relay_curl_timer_callback callback, void *context) {
    CURLMcode code = curl_multi_setopt(multi, CURLMOPT_TIMERFUNCTION, callback);
    return code != CURLM_OK ? code : curl_multi_setopt(multi, CURLMOPT_TIMERDATA, context);
}

/// Watches `fd` for CURL_POLL_IN / OUT / INOUT (`what`): adds it when `add`, else changes its
/// interest; or stops watching it (CURL_POLL_REMOVE). Level-triggered.
static inline int relay_epoll_watch(int epoll, int fd, int what, int add) {
    if (what == CURL_POLL_REMOVE) {
        return epoll_ctl(epoll, EPOLL_CTL_DEL, fd, NULL) == 0 || errno == ENOENT || errno == EBADF ? 0 : -1;
    }
    struct epoll_event event = {0};
    event.events = (what & CURL_POLL_IN ? EPOLLIN : 0) | (what & CURL_POLL_OUT ? EPOLLOUT : 0);
    event.data.fd = fd;
    return epoll_ctl(epoll, add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &event);
}
/// Waits up to `timeout` ms; fills `fds` and curl's CURL_CSELECT_* flags for up to `capacity` ready
/// descriptors; returns how many (0 on timeout or EINTR, -1 on another error).
static inline int relay_epoll_wait(int epoll, int *fds, int *flags, int capacity, int timeout) {
    struct epoll_event events[256];
    if (capacity > 256) capacity = 256;
    int count = epoll_wait(epoll, events, capacity, timeout);
    if (count < 0) return errno == EINTR ? 0 : -1;
    for (int index = 0; index < count; index++) {
        uint32_t ready = events[index].events;
        fds[index] = events[index].data.fd;
        flags[index] = (ready & EPOLLIN ? CURL_CSELECT_IN : 0) | (ready & EPOLLOUT ? CURL_CSELECT_OUT : 0)
            | (ready & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
    }
    return count;
}
/// An eventfd readable while signalled, for waking the loop from other threads.
static inline int relay_eventfd_open(void) { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }
static inline int relay_eventfd_watch(int epoll, int fd) {
    struct epoll_event event = {0};
    event.events = EPOLLIN;
    event.data.fd = fd;
    return epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event);
}
static inline void relay_eventfd_signal(int fd) {
    uint64_t one = 1;
    ssize_t written = write(fd, &one, sizeof one);
    (void)written;  // EAGAIN: the counter is already signalled, which is all a wake-up needs
}
static inline void relay_eventfd_drain(int fd) {
    uint64_t value;
    ssize_t got = read(fd, &value, sizeof value);
    (void)got;
}

/// A curl_slist of the `count` NUL-terminated lines packed in `text`, nodes and text in one
/// allocation: free it with free(), never curl_slist_free_all. libcurl only reads the list.
static inline struct curl_slist *relay_slist_pack(const void *text, size_t length, int count) {
    if (count < 1) return NULL;
    struct curl_slist *nodes = malloc(sizeof(struct curl_slist) * (size_t)count + length);
    if (nodes == NULL) return NULL;
    char *line = (char *)(nodes + count);
    memcpy(line, text, length);
    for (int index = 0; index < count; index++) {
        nodes[index].data = line;
        nodes[index].next = index + 1 < count ? &nodes[index + 1] : NULL;
        line += strlen(line) + 1;
    }
    return nodes;
}

/// The finished transfer and its result from a CURLMSG_DONE message.
static inline CURL *relay_curl_msg_easy(CURLMsg *message) { return message->easy_handle; }
static inline CURLcode relay_curl_msg_result(CURLMsg *message) { return message->data.result; }
static inline int relay_curl_msg_is_done(CURLMsg *message) { return message->msg == CURLMSG_DONE; }

#endif
