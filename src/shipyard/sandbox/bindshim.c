/* shipyard's bind() shim (LD_PRELOAD), used on Ray nodes: see shipyard/sandbox/bindshim.py.
 *
 * A TCP socket bound to a wildcard address listens on every interface of the node. With
 * SHIPYARD_BIND_ADDRESS set to the node's cluster address (IPv4 or IPv6):
 *   0.0.0.0               -> the cluster address (127.0.0.1 when that address is IPv6)
 *   :: on a dual-stack    -> ::ffff:<ipv4> (the cluster address, for IPv4 and IPv4-mapped
 *                            peers), or the IPv6 cluster address
 *   :: on an IPv6-only    -> the IPv6 cluster address, else ::1 (an IPv4 cluster has no
 *                            IPv6 address to offer; loopback keeps the program working)
 * The port, every non-wildcard bind, and every non-TCP socket are left as they are. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static int (*real_bind)(int, const struct sockaddr *, socklen_t);
static struct in_addr want4;
static struct in6_addr want6;
static int family; /* AF_INET or AF_INET6 once SHIPYARD_BIND_ADDRESS parses, else 0 */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void) {
    const char *text = getenv("SHIPYARD_BIND_ADDRESS");
    real_bind = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
    if (text == NULL) return;
    if (inet_pton(AF_INET, text, &want4) == 1) family = AF_INET;
    else if (inet_pton(AF_INET6, text, &want6) == 1) family = AF_INET6;
}

static int is_tcp(int fd) {
    int type = 0;
    socklen_t len = sizeof type;
    return getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM;
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    pthread_once(&once, init);
    if (family == 0 || addr == NULL || !is_tcp(fd)) return real_bind(fd, addr, len);
    if (addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in in4;
        memcpy(&in4, addr, sizeof in4);
        if (in4.sin_addr.s_addr != htonl(INADDR_ANY)) return real_bind(fd, addr, len);
        if (family == AF_INET) in4.sin_addr = want4;
        else in4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        return real_bind(fd, (const struct sockaddr *)&in4, sizeof in4);
    }
    if (addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 in6;
        int v6only = 0;
        socklen_t optlen = sizeof v6only;
        memcpy(&in6, addr, sizeof in6);
        if (!IN6_IS_ADDR_UNSPECIFIED(&in6.sin6_addr)) return real_bind(fd, addr, len);
        getsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &optlen);
        if (family == AF_INET6) {
            in6.sin6_addr = want6;
        } else if (v6only) {
            in6.sin6_addr = in6addr_loopback;
        } else {
            memset(&in6.sin6_addr, 0, sizeof in6.sin6_addr);
            in6.sin6_addr.s6_addr[10] = 0xff;
            in6.sin6_addr.s6_addr[11] = 0xff;
            memcpy(&in6.sin6_addr.s6_addr[12], &want4, 4);
        }
        return real_bind(fd, (const struct sockaddr *)&in6, sizeof in6);
    }
    return real_bind(fd, addr, len);
}
