#!/bin/sh
# Render the template with the ORS_* settings (defaults as in orsplatform/settings.py) and run nginx
# in the foreground. Only the names listed are substituted: nginx's own $variables stay as they are.
set -eu
: "${ORS_NGINX_RUN_DIR:=/run/ors-nginx}"
: "${ORS_NGINX_LISTEN:=8080}"
: "${ORS_NGINX_UPSTREAMS:=server web:8000 max_fails=0;}"
: "${ORS_NGINX_OPEN_FILES:=65536}"
: "${ORS_NGINX_WORKER_CONNECTIONS:=16384}"
: "${ORS_NGINX_CONNECTIONS_PER_CLIENT:=4096}"
: "${ORS_HEADER_TIMEOUT_SECONDS:=10}"
: "${ORS_MAX_REQUEST_BYTES:=1048576}"
: "${ORS_MAX_BODY_BYTES:=10485760}"
# The upload limits of settings.py plus 1 MiB of multipart framing (perimeter/bodies.py's slack).
: "${ORS_MAX_PACKAGE_UPLOAD_BYTES:=68157440}"
: "${ORS_MAX_TASK_UPLOAD_BYTES:=4296015872}"
export ORS_NGINX_RUN_DIR ORS_NGINX_LISTEN ORS_NGINX_UPSTREAMS ORS_NGINX_OPEN_FILES ORS_NGINX_WORKER_CONNECTIONS \
  ORS_NGINX_CONNECTIONS_PER_CLIENT ORS_HEADER_TIMEOUT_SECONDS ORS_MAX_REQUEST_BYTES ORS_MAX_BODY_BYTES \
  ORS_MAX_PACKAGE_UPLOAD_BYTES ORS_MAX_TASK_UPLOAD_BYTES
names='${ORS_NGINX_RUN_DIR} ${ORS_NGINX_LISTEN} ${ORS_NGINX_UPSTREAMS} ${ORS_NGINX_OPEN_FILES}
${ORS_NGINX_WORKER_CONNECTIONS} ${ORS_NGINX_CONNECTIONS_PER_CLIENT} ${ORS_HEADER_TIMEOUT_SECONDS}
${ORS_MAX_REQUEST_BYTES} ${ORS_MAX_BODY_BYTES} ${ORS_MAX_PACKAGE_UPLOAD_BYTES} ${ORS_MAX_TASK_UPLOAD_BYTES}'
mkdir -p "$ORS_NGINX_RUN_DIR"
envsubst "$names" < /etc/ors-nginx/ors.conf.template > "$ORS_NGINX_RUN_DIR/nginx.conf"
exec nginx -e stderr -p "$ORS_NGINX_RUN_DIR" -c "$ORS_NGINX_RUN_DIR/nginx.conf" -g 'daemon off;'
