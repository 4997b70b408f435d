#[test]
fn print_examples() {
    let uuid: [u8; 16] = std::array::from_fn(|i| i as u8);
    let id = crate::encode_identity(&uuid);
    let rec = lanefs::Record::Free {
        inode: lanefs::InodeId {
            ino: lanefs::Ino(1025),
            generation: lanefs::Generation(7),
        },
    }
    .to_bytes();
    let seg = crate::journal::encode_segment(uuid, 1, 1, &[&rec]);
    for (name, b) in [("id", &id[..]), ("seg", &seg[..])] {
        println!("{name}");
        for c in b.chunks(16) {
            println!(
                "{}",
                c.iter()
                    .map(|x| format!("{x:02x}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
    }
}
