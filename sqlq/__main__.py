from sqlq.cli import main

main()
