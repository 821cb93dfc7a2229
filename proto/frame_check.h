/* SPDX-License-Identifier: Apache-2.0 */
#ifndef KVQ_FRAME_CHECK_H
#define KVQ_FRAME_CHECK_H

#include <stddef.h>

#include "frame.h"

/*
 * Checks what needs no state against the protocol (kvq.proto, "Limits" and
 * field comments): a body is set; a request is a request type with status 0
 * (is_request) or a reply a reply type; counts, lengths and names are within
 * limits.  Returns 0, -EOPNOTSUPP (no or wrong-direction body), -E2BIG (a
 * limit), -EINVAL (a malformed value, e.g. unequal pairs, a name with
 * blanks) or -EBADMSG (a request with a status), with a message naming the
 * field in err (may be NULL).
 */
int kvq_frame_check(const Kvq__Envelope *e, int is_request, char *err, size_t errlen);

#endif
