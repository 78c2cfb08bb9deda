#!/bin/bash
# Oracle solution (reference; never shown to the agent).
set -euo pipefail
cat > /app/backup.sh <<'EOF'
#!/bin/bash
# backup.sh SRC DEST: copy every .txt file under SRC (recursively) into DEST, keeping the relative paths,
# then print "copied N files".
SRC=$1
DEST=$2
count=0
mkdir -p "$DEST"
while IFS= read -r -d '' f; do
    rel=${f#"$SRC"/}
    mkdir -p "$DEST/$(dirname "$rel")"
    cp "$f" "$DEST/$rel"
    count=$((count + 1))
done < <(find "$SRC" -type f -name '*.txt' -print0)
echo "copied $count files"
EOF
