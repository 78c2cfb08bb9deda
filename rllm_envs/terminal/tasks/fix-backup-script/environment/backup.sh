#!/bin/bash
# backup.sh SRC DEST: copy every .txt file under SRC (recursively) into DEST, keeping the relative paths,
# then print "copied N files".
SRC=$1
DEST=$2
count=0
mkdir -p $DEST
ls $SRC/*.txt | while read f; do
    cp $f $DEST/
    count=$((count + 1))
done
echo "copied $count files"
