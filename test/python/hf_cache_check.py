"""huggingface_hub's view of a Hugging Face cache, for test/models-download.test.ts.

  hf_cache_check.py read CACHE_DIR REPO_ID
      -> {"snapshot": <snapshot_download(local_files_only=True)>, "repos": [...], "warnings": [...]}
  hf_cache_check.py download ENDPOINT CACHE_DIR REPO_ID
      -> {"snapshot": <snapshot_download from ENDPOINT into CACHE_DIR>}

Prints one JSON object on stdout.
"""
import json
import sys

from huggingface_hub import scan_cache_dir, snapshot_download


def main() -> None:
    mode = sys.argv[1]
    if mode == "read":
        cache_dir, repo_id = sys.argv[2], sys.argv[3]
        snapshot = snapshot_download(repo_id, cache_dir=cache_dir, local_files_only=True)
        info = scan_cache_dir(cache_dir)
        repos = [
            {
                "repo_id": r.repo_id,
                "repo_type": r.repo_type,
                "revisions": [
                    {"commit": rev.commit_hash, "refs": sorted(rev.refs), "files": sorted(f.file_name for f in rev.files), "size": rev.size_on_disk}
                    for rev in r.revisions
                ],
            }
            for r in info.repos
        ]
        print(json.dumps({"snapshot": snapshot, "repos": repos, "warnings": [str(w) for w in info.warnings]}))
    elif mode == "download":
        endpoint, cache_dir, repo_id = sys.argv[2], sys.argv[3], sys.argv[4]
        print(json.dumps({"snapshot": snapshot_download(repo_id, cache_dir=cache_dir, endpoint=endpoint)}))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
