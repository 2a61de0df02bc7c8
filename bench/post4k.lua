-- wrk script for post_4k: POST a 4,096-byte body.
wrk.method = "POST"
wrk.body = string.rep("x", 4096)
wrk.headers["Content-Type"] = "application/octet-stream"
